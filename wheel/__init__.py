"""The dispatcher: a two-level timing wheel over the hourly delay logs.

One concept per module, read in this order:

    source.py        SlotSource, what the wheel asks storage
    delay_queue.py   DelayQueue, the non-empty slots, earliest first
    timing_wheel.py  TimingWheel, seconds wheel (3600 x 1 s) under the hours wheel
    window.py        PreloadWindow, the next ~10 s of entries, released in order
    tick_state.py    TickState and its two-slot file (dispatch progress)
    scheduler.py     Scheduler, the three above driven by now_ms
    clock.py         Clock protocol (tests/fakes.py has a FakeClock)
    driver.py        WheelDriver, the asyncio task: poll, deliver, persist, sleep

Nothing here reads the system clock: time comes in as now_ms or through an
injected Clock (the real one lives in broker/). Nothing is imported here,
so `import wheel` stays cheap and side-effect free.
"""
