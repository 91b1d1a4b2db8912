"""The app's pages (listed in app.py) and their shared helpers (modules starting with "_")."""
