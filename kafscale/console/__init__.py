"""The console (`kafscale console`): a web UI for a KafScale cluster (docs/design/console.md)."""
