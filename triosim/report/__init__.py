"""triosim.report.summary."""
