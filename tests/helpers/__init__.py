"""Helpers that several test modules share: builders, reference runs, fixtures and launched ranks."""
