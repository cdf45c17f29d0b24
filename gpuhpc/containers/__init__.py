"""Container images for jobs (pyxis and enroot): image references, mounts, the site's trust
policy (docs/containers.md). Stdlib only: ``gpuhpc submit`` imports it on every call."""
