"""The built-in console (docs/console.md): `GET /console`, its page,
its login, and the JSON endpoints the page draws from.

    api.py    Console: the page and its JSON endpoints
    login.py  the login form, trading the token for a session
    page.py   the pages: HTML, script and SVG inline, nothing to build

The sessions its cookie holds are broker.http.sessions (the front checks
them on every console request).

It imports storage, broker.core, broker.observe, broker.http and
broker.schedules (the forecast folds in schedules' coming runs). The nodes
and the cluster import it.
"""
