"""The slow tier holding every table's rows and their optimizer state."""
