"""Helpers several backends share (none of them a kernel a capability record names)."""
