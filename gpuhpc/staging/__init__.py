"""Data and checkpoint staging between S3 and node-local storage (only s3.py imports boto3)."""
