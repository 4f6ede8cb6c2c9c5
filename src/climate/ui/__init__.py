"""The web dashboard's files (``static/``), served at /ui by ``climate.api.ui``."""
