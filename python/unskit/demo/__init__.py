"""`unskit demo`: the whole edge stack for a first-time user."""
