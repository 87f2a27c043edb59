"""Recurring schedules (docs/api.md, "Recurring schedules"): kept durable,
and each one's next run made as an ordinary message.

    keeper.py    Schedules: the node's schedules, and their runs over any Backend
    file.py      the schedules file: their states on disk
    params.py    the endpoints' parameters, validated whole
    api.py       putSchedule, deleteSchedule, pauseSchedule ... (the endpoints)
    forecast.py  the runs to come, for the console's forecast
    metrics.py   /metrics' schedules series

Their time rules (cron, every, misfire) are broker.core.recurrence, since
every message answered or pushed names the run it is.

It imports storage, wheel, broker.core, broker.observe, broker.backend
and broker.http (the endpoints' answers). broker.console, broker.redis
(its schedules), broker.cluster and the nodes import it.
"""
