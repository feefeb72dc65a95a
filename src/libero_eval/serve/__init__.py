"""Serving a policy: the serve job, the server settings and command lines, process-group
lifecycle (SGLang, openpi, or the reference server)."""
