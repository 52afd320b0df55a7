"""Speculative decoding: the verify loop, the drafter protocol and drafters, costs, adaptive length,
routing, stats."""
