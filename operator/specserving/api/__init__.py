"""The SpecServing API: typed spec and status, the CRD generated from them, and parsing of raw objects."""
