"""Constrained output: grammars (JSON, JSON schema, GBNF) every emitted token keeps satisfiable."""
