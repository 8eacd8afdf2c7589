"""Drives the object-store emulators of tests/storage.rs with each cloud's
own SDK (boto3 for S3, azure-storage-blob for Azure), as a team publishing
models would: make a bucket, upload a file as an object, delete one.

usage: store.py s3|azure PORT bucket NAME
       store.py s3|azure PORT put BUCKET KEY FILE
       store.py s3|azure PORT delete BUCKET KEY
"""
import sys

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


def main(kind, port, command, *args):
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


if __name__ == "__main__":
    main(*sys.argv[1:])
