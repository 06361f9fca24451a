"""The ``zmesh`` command: run nodes, publish, subscribe, inspect, and the local demo.

Entry point: ``zmesh.cli.main:main`` (also ``python -m zmesh.cli``).
"""
