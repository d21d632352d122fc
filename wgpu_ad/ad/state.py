"""The tape currently recording kernel launches (None when none is). Imports nothing."""
current_tape = None
in_backward = False
