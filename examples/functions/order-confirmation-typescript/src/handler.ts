import type { OrderCreated } from "../shared/events";
import { confirmationMessage } from "./message";

// Runs for every order.created event. Relay only strips the types; run
// `tsc --noEmit` yourself if you want them checked.
export async function handler(event: OrderCreated): Promise<void> {
  console.log(confirmationMessage(event));
}
