"""How nodes find each other: mDNS on the LAN, static seeds elsewhere (both a
``Discovery``, base.py)."""
