"""Serverless endpoints (docs/endpoints.md): a renter's requests in, workers that scale with them, to zero and back.

So far the pure autoscaler (autoscaler.py); the worker's handler library is common/endpoint_worker/.
"""
