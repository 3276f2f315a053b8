"""archplace as a service: studies of architectures over HTTP (ask/tell), managed evaluations as
long-running operations, persisted in SQLite or any SQLAlchemy database, served by Ray Serve.

Modules: ``schemas`` (request/response models and their limits), ``db`` (tables, engine, write
transactions), ``auth`` (hashed bearer tokens), ``searchers`` (ask/tell over the Tune searchers),
``studies`` and ``operations`` (the logic), ``app`` (FastAPI routes and errors), ``deployment``
(Ray Serve) and ``cli`` (``archplace serve``). The client is ``archplace.client``.
"""
