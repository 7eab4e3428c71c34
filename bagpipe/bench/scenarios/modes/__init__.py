"""``bagpipe bench modes``: full / nocache / lru / lookahead side by side, memory and disk stores."""
