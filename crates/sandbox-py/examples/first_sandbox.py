import anyio
import sandboxio


async def main() -> None:
    async with await sandboxio.create("rsdocker://sandbox-rs/python:3.11") as sb:
        result = await sb.run(["echo", "hello from sandbox-rs"])
        print(result.stdout, end="")
        await sb.run_code("x = 41 + 1", context_id="notebook")
        print((await sb.run_code("print(x)", context_id="notebook")).stdout, end="")


anyio.run(main)
