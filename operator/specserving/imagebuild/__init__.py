"""Building the serving image that carries the fixed PD decode path: when to build, and the build Job."""
