"""Plans: load YAML with positions, validate against the schema, resolve into dataclasses."""
