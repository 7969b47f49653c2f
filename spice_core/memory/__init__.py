"""Memory mechanisms: where expert weights live. They act; policies decide."""
