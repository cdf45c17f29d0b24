"""Test-only stand-ins that gpuhpc switches to through environment variables (never by default)."""
