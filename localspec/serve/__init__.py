"""The OpenAI-compatible server and the one rule for binding any server.

- ``app``: binding the address, running uvicorn (``serve``, ``start_background``); the names it had before
- ``options``: how the server listens and what it accepts (``ServeOptions``), its exposure line
- ``routes``: the ASGI app (``create_app``): the OpenAI routes, ``/health``, ``/metrics``
- ``schemas``: request bodies read and checked, and OpenAI-style error bodies (``APIError``)
- ``endpoint``: a checked request turned into a queued job, the job's events into a response or a stream
- ``worker``: the request queue and the one thread that runs its generations in arrival order
- ``metrics``: the counters and the Prometheus text of ``/metrics``
- ``middleware``: a loopback server's ``Host`` check, and a bug answered as a 500 JSON
- ``exposure``: the one rule for binding any localspec server (who may connect)
"""
