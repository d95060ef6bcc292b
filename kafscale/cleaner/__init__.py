"""The log cleaner of compacted topics (docs/design/ecosystem.md, section 4)."""
