"""What the management API (management/api/) and the web console (management/console/) share over HTTP: the one
error shape and the table mapping error codes to statuses (``errors``), request schemas and their field types
(``schemas``), request parsing (``requests``) and cursor paging (``paging``). Neither of the two imports the other
for these, so the API may add the console to its app without an import cycle."""
