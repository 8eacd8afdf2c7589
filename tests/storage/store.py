"""Drives the object-store emulators of tests/storage.rs with each cloud's
own SDK (boto3 for S3, azure-storage-blob for Azure) or API (Cloud
Storage's JSON API for GCS), as a team publishing models would: make a
bucket, upload a file as an object, delete one.

usage: store.py s3|azure|gcs PORT bucket NAME
       store.py s3|azure|gcs PORT put BUCKET KEY FILE
       store.py s3|azure|gcs PORT delete BUCKET KEY
"""
import json
import sys
import urllib.parse
import urllib.request

# Azurite's well-known development account.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def s3(port):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        aws_access_key_id="publisher",
        aws_secret_access_key="publisher-secret",
        region_name="us-east-1",
    )


def azure(port):
    from azure.storage.blob import BlobServiceClient

    return BlobServiceClient.from_connection_string(
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};"
    )


class Gcs:
    """Cloud Storage's JSON API, as `gsutil` and the client libraries call
    it: fake-gcs-server takes uploads only this way (a simple media
    upload), not as object_store's XML-API PUT."""

    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"

    def call(self, method, path, body=b"", content_type="application/octet-stream"):
        request = urllib.request.Request(
            self.base + path, data=body, method=method, headers={"Content-Type": content_type}
        )
        with urllib.request.urlopen(request) as response:
            response.read()

    def bucket(self, name):
        self.call("POST", "/storage/v1/b?project=test", json.dumps({"name": name}).encode(), "application/json")

    def put(self, bucket, key, data):
        query = urllib.parse.urlencode({"uploadType": "media", "name": key})
        self.call("POST", f"/upload/storage/v1/b/{bucket}/o?{query}", data)

    def delete(self, bucket, key):
        self.call("DELETE", f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(key, safe='')}")


def main(kind, port, command, *args):
    if kind == "gcs":
        return gcs(Gcs(port), command, *args)
    client = s3(port) if kind == "s3" else azure(port)
    if command == "bucket":
        (name,) = args
        if kind == "s3":
            client.create_bucket(Bucket=name)
        else:
            client.create_container(name)
    elif command == "put":
        bucket, key, path = args
        with open(path, "rb") as data:
            if kind == "s3":
                client.put_object(Bucket=bucket, Key=key, Body=data.read())
            else:
                client.get_blob_client(bucket, key).upload_blob(data, overwrite=True)
    elif command == "delete":
        bucket, key = args
        if kind == "s3":
            client.delete_object(Bucket=bucket, Key=key)
        else:
            client.get_blob_client(bucket, key).delete_blob()
    else:
        sys.exit(f"unknown command {command}")


def gcs(client, command, *args):
    if command == "bucket":
        client.bucket(*args)
    elif command == "put":
        bucket, key, path = args
        with open(path, "rb") as data:
            client.put(bucket, key, data.read())
    elif command == "delete":
        client.delete(*args)
    else:
        sys.exit(f"unknown command {command}")


if __name__ == "__main__":
    main(*sys.argv[1:])
