"""The API's handlers, one module per resource: each handler turns HTTP into one call on the services and answers a
typed struct (management/http/responses.py, built by management/views.py). Routes are declared in
management/api/routing.py, never here."""
