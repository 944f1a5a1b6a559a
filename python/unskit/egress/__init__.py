"""File egress: watch a source directory, deliver each settled file to every configured
destination with resume, verification and bandwidth control, then delete or archive it."""
