"""Converters between hetauto's profile schema and other planners' formats."""
