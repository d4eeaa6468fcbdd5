"""Session fixtures for the real test bed (Docker engine, stand-in images, Redis).

Filled in by the test bed work; see scripts/testbed.
"""
