"""Helpers the tests share: builders, fixtures and runs that more than one test module uses."""
