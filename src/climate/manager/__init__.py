"""The manager: fires each event at its time, runs resource and backend actions, records results."""
