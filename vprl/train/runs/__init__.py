"""The run folder: config, manifest, checkpoints, logs and resume (`folder`), the manifest's contents
(`manifest`)."""
