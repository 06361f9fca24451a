"""``zmesh web``: a live page of the whole mesh (the ``web`` extra: aiohttp).

``app.py`` serves the page and its server-sent events, ``source.py`` reads the mesh (from
a node of its own or from a node's HTTP API), ``history.py`` keeps the last minutes of
every lane; ``static/`` holds the page, its script and uPlot (MIT, shipped as it is), so
nothing is fetched from the internet at run time.
"""
