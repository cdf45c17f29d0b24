"""Test stand-ins for hardware the test machines lack (imported as ``standins.*`` with tests/ on the path)."""
