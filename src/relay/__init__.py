"""Relay: an event-driven function runner."""
