"""The language server: turns document events into jobs and stored results into editor features."""
