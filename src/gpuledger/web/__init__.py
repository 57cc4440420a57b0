"""HTTP: the WSGI applications over the latest snapshot, and the server that binds them.

- ``app``: ``WsgiApp`` (routes, methods, headers, the render cache) and the node's application
- ``fleet_app``: the fleet controller's application
- ``server``: waitress and its limits; ``bind``, the one entry point of every command that serves
- ``webconfig``: ``--web-config FILE`` (exporter-toolkit's format)
- ``auth``: bcrypt basic auth, as WSGI middleware
- ``tls_front``: the asyncio TLS front to waitress
"""
