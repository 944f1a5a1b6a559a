"""The camera adapter: durable still-image captures on command or schedule, a SQLite catalog
of job states, images and sidecars on disk, and terminal announcements on the camera's app
class."""
