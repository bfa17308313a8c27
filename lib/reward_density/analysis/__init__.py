"""Finished cells into tables, statistics, figures and the report."""
