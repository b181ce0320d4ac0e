"""The API's handlers, one module per resource: each handler turns HTTP into one call on the services and answers a
typed struct (management/views/, beside the function that builds it). Routes are declared in
management/api/routing.py, never here."""
