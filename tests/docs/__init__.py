"""Tests that run the README's quickstart code against real brokers."""
