"""The dashboard's pages, one module per page with its admin actions, each exporting
``ROUTES``; :func:`awa_fast.web.app.create_app` mounts them."""
