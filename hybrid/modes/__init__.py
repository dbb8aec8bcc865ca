"""hybrid.modes."""
