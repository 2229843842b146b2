"""The executor layer: the image API programs see, tool backends, tool host, sandbox and batch runner."""
