"""What the CLI shows: job facts for `status`, the rich tables, charts and the HTML report. May import the ground floor, sizing, spot and backends; never the CLI."""
