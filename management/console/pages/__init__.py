"""The console's pages, one module per area; each has ``add_routes(router)`` and may list ``NAV`` entries.

Modules here are found by name at start (management/console/__init__.py), so an area is added by adding its module.
"""
