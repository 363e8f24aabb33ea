"""The queue on PostgreSQL: schema, migrations, named statements and the store."""
