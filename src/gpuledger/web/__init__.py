"""HTTP: the WSGI application over the latest snapshot, and the server that binds it."""
