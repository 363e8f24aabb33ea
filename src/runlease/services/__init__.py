"""Background loops shared by processes: leader election, the reaper, the listener."""
