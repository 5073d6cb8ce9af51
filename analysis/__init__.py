"""Derivations, numeric checks, property tables, certificates and hardness statistics."""
