"""Presets and the Hugging Face Hub: TOML presets, checked downloads, the Hub-wide draft search."""
